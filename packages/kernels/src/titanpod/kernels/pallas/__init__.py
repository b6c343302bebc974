"""titanpod's Pallas kernels as JAX functions, in modules that import only JAX, numpy and the standard library.

``splash_kernel`` (Splash attention), ``loss_kernel`` (output projection + cross-entropy) and ``gmm_kernel``
(the experts' grouped matmul) build the kernels the PyTorch ops of ``titanpod.kernels`` run. Importing
``titanpod.kernels.pallas`` runs ``titanpod.kernels``'s own ``__init__``, which imports PyTorch; where
PyTorch is not installed, ``tools/bench/pallas_on_tpu.py`` registers ``titanpod.kernels`` as a bare package
(its folder, no ``__init__``) and imports these modules by name.
"""
