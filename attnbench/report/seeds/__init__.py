"""The seed reports held against the measurements: their claims (``claims``, read from
``seed_claims.toml``), what the rows of one machine measure of each (``measured``), the
verdict rule (``verdicts``; docs/design/verdicts.md says it in words) and ``seeds.md`` with the
summary the report's first screen carries (``page``)."""
