"""GPU kernels (optional): modules here import Triton at module level and are loaded lazily by the math package.

- :mod:`.js_triton`: fused Jensen–Shannon divergence per token row (used by ``js_distance`` on CUDA).
"""
