"""The part of sharding_lab that needs torch: the model, `parallelize`, rank launching, the trackers,
the measurement, the FakeTensorMode simulation. Everything outside this package is torch-free, and
private torch internals are reached only through `_torch_internals`.
"""
