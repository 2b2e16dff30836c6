"""OpenCL C kernels for on-device training and the Python that builds and launches them.

This package knows nothing of the rest of mgfl: it takes OpenCL buffers and shapes and returns
bound launches (:class:`kernels.launch.Launch`). Each ``*.cl`` file under ``cl/`` has a Python
module of the same name here that builds its launches, and a NumPy float64 reference under
``reference/``.
"""
