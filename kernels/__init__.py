"""The Triton kernels (CUDA; on a CPU the tests run them in Triton's interpreter): flash_sink, flash attention with a
sink (softmax-1, attention bias), forward and backward, which attention.py calls; orthoadam, OrthoAdam's whole step for
one parameter, which orthoadam.py calls."""
