"""The schedule matrix: a TOML spec expanded into cells, each primed, continued and judged against
its oracle, written as one receipt (``harness run-matrix``).

A *spec* names models, prompts, schedule variants, K values, sampling settings and the
continuation length; :func:`.specfile.load_spec` reads and validates it (one-line errors naming
the file, the key and what was expected, before anything runs) and :func:`.cells.expand` turns it
into :class:`~.cells.Cell` s. Each cell is one (model, prompt, variant + its arguments, K,
sampling): :func:`.runner.run_cell` primes the prompt under that schedule with the MTP prime
walker, then generates ``max_new_tokens`` tokens speculatively; :func:`.verdict.verdict` judges it
against its *oracle*, the ``unyielded`` cell of the same model, prompt, K and sampling.
:func:`.runner.run_matrix` runs the cells and returns the receipt (:mod:`.receipts`), which
:mod:`.diff` compares and :mod:`.plots` draws. :mod:`.builtin` names the built-in specs and their
golden receipts.
"""
