"""The part of sharding_lab that needs torch: the model, `parallelize`, rank launching, the trackers,
the measurement, the FakeTensorMode simulation. Everything outside this package is torch-free, and
private torch internals are reached only through `_torch_internals`.
"""

import warnings

# Without numpy installed, torch warns on importing FSDP2's tensor subclasses ("Failed to initialize
# NumPy"), once in every rank. The engine never converts a tensor to numpy: the line is noise.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
