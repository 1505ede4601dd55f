"""The report's figures (``figures``: small multiples per implementation family, drawn from
one machine's rows, and the answer's bars)."""
