"""The report's figures (``figures``: small multiples per implementation family, drawn from
one machine's rows) and the picture of a block pattern ``attnbench pattern`` draws
(``pattern``)."""
