"""GPU evidence: ``harness device-check`` / ``device-walker`` (:mod:`.devicecheck`, CUDA against
the CPU twin, bit for bit) and ``harness bench`` (:mod:`.bench`, bench-8l against transformers
and hardware anchors). Both need a CUDA GPU; importing them does not."""
