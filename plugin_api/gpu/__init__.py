"""Helpers that several GPU plugins share: which torch platform a device is (``platforms``), its
graph classes (``device_graphs``), small runs on the device that read what torch does there
(``device_trials``, read through ``torch_facts``), GEMM through torch (``torch_gemm``) and where
Triton kernels run (``triton_target``). Nothing here is imported by selection."""
