"""The `studyapp` command line: a Flask command group that builds the app with create_app.

    serve.py     serve                                  bank.py      bank sync | check | import-quiz
    anki.py      export-anki [--check]                  labs.py      labs run-all
    history.py   export-history, import-history         token.py     token [--rotate]
    (studyapp.migrate: db upgrade | current | revision)

To add a command, define it (a click command or an AppGroup) and list it in COMMANDS;
`init_app` registers each one on `app.cli`, so `app.test_cli_runner()` sees it too.
"""

from __future__ import annotations

import os
from importlib import metadata

import click
from flask import Flask
from flask.cli import FlaskGroup, ScriptInfo

from studyapp.cli.anki import export_anki_command
from studyapp.cli.bank import bank_group
from studyapp.cli.errors import explained, run_explained, shown_url
from studyapp.cli.history import export_history_command, import_history_command
from studyapp.cli.labs import labs_group
from studyapp.cli.serve import serve_command
from studyapp.cli.token import token_command
from studyapp.migrate import db_group

COMMANDS = (
    serve_command,
    bank_group,
    export_anki_command,
    labs_group,
    db_group,
    export_history_command,
    import_history_command,
    token_command,
)


def init_app(app: Flask) -> None:
    for command in COMMANDS:
        app.cli.add_command(command)


DISTRIBUTION = "sharding-study"  # pyproject's name: its installed metadata has the app's version


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"studyapp {metadata.version(DISTRIBUTION)}")
        ctx.exit()


def _create_app() -> Flask:
    from studyapp import create_app

    return create_app(upgrade_schema=False)  # each command that uses the database upgrades it first


class StudyappGroup(FlaskGroup):
    """Flask's command group, with a database, migration, setting or file error said in one line (cli.errors).
    Flask's own --app, --env-file and --debug are left out: the app is always create_app's (configured
    by instance/config.py and STUDYAPP_* variables), and `serve --debug` is the debug switch. --version is
    the app's own, not Flask's."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.params = [p for p in self.params if p.name not in ("app", "env_file", "debug", "version")]
        self.params.append(click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True,
                                        callback=_print_version, help="Show the app's version and exit."))

    def invoke(self, ctx: click.Context):
        return run_explained(lambda: super(StudyappGroup, self).invoke(ctx), lambda: _database_url(ctx))

    def list_commands(self, ctx: click.Context) -> list[str]:
        """For --help: an app that a user's error stops (a bad setting in instance/config.py) is said in
        one line, as a command says it; Flask's own would print the traceback."""
        try:
            ctx.ensure_object(ScriptInfo).load_app()
        except Exception as error:
            line = explained(error, lambda: _database_url(ctx))
            if line is not None:
                click.secho(f"Error: {line}\n", err=True, fg="red")
                return super(FlaskGroup, self).list_commands(ctx)  # the group's own, without the app's
        return super().list_commands(ctx)  # Flask's: a bug's traceback is printed there


def _database_url(ctx: click.Context) -> str:
    try:
        return shown_url(ctx.ensure_object(ScriptInfo).load_app().config["DATABASE_URL"])
    except Exception:  # the app itself could not be made: say what the environment asked for
        return shown_url(os.environ.get("STUDYAPP_DATABASE_URL", "(the configured DATABASE_URL)"))


main = StudyappGroup(
    name="studyapp",
    help="The sharding study app.",
    create_app=_create_app,
    add_default_commands=False,
    load_dotenv=False,
    set_debug_flag=False,
)
