"""A crash-safe fuzzer over bad inputs to every public op (``python -m plugin_api.fuzz``).

Hypothesis draws a valid call of an op and mutates it (dtypes, shapes, strides, devices,
out-of-range ids, non-finite values, aliased outputs, foreign plans...); each example runs in a
worker process, so that a kernel that crashes is counted, not fatal. See docs/fuzzing.md.
Nothing here is imported by ``import plugin_api``; hypothesis (extra ``test``) is needed.
"""
