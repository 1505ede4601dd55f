"""One trial and the checks around it: the call it makes (``workload``: shape, dtype, device,
mode; FLOPs and floor bytes), the measured run in this process or in a worker of its own
(``trial``), the float64 reference an implementation is checked against (``reference``), the
contract an outside implementation is held to (``contract``), and outside code as attnbench's
own process sees it, described and built by workers (``supervised``)."""
