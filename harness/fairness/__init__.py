"""Prime fairness: a long prime beside peer sessions, under several scheduling policies
(``harness fairness``).

A *spec* (:mod:`.specfile`) names the model, the long prompt, the peers (arrivals, prompts,
continuations), the policies and the chunk rows. :func:`.runner.run_fairness` runs every session
alone, then all of them under each policy with the cooperative scheduler
(:mod:`harness.walk.scheduler`), judges every session's digests bitwise against its alone run
and measures what each policy does to the peers' first-event latency and to the long prompt's
time to first token. The receipt (:mod:`.receipt`) is a matrix-style receipt of kind
``"fairness"``; :mod:`.plots` draws its timeline and latency figures.
"""
