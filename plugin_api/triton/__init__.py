"""Portable Triton kernels that GPU plugins share (optional extra ``plugin-api[triton]``).

One module per kernel family (``quant``, ``attention``, ``cache_write``, ``state_copy``,
``scaled_mm``), each importing triton at the top; ``numerics`` holds their exact rounding
helpers, ``launch`` the per-device launch tables and ``impl`` the implementation objects that
follow the host's op protocols. Those objects import the kernel modules only when a kernel first
runs, so a plugin can list them (and ``supports`` can answer what-if questions) on a machine
without triton. Neither ``import plugin_api`` nor backend selection imports this package; a
plugin declares where the kernels run with ``plugin_api.gpu.triton_target.TritonTarget``.

On the CPU the kernels run only under ``TRITON_INTERPRET=1`` (tests); there is no Triton-on-CPU
backend.
"""
