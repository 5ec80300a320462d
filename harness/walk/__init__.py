"""The walk layer: priming a prompt under a schedule and continuing it, on top of the engine.

:mod:`.schedule` plans which prompt rows run batched and which token by token; :mod:`.protocol`
is the resumable prime-walker protocol (one chunk per advance) and its drivers;
:mod:`.mtp_walker` is the MTP prime walker; :mod:`.check` the seed's yielded-vs-unyielded check;
:mod:`.speculative` speculative (and plain) decoding after a prime; :mod:`.sampling` the
counter-RNG sampling both use; :mod:`.scheduler` the cooperative scheduler that interleaves
sessions on one engine, one unit of work (a prime chunk, a speculative round, a decode step) per
tick.
"""
