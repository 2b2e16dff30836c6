"""mgfl: federated and continual learning on phone GPUs through OpenCL.

This package holds what both sides share and what the user touches: model descriptions, data sets,
update codecs, metrics, configuration and the command line. It imports none of ``kernels``,
``client_runtime`` or ``server`` at module level.
"""

__version__ = "0.1.0"
