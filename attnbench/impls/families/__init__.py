"""The built-in implementations, declared without torch: one module per family, each
registering its implementations' ``ImplSpec`` (parameters, what they support, their code by
``Lazy("module:function")``). The registry imports every module here (``dense`` first) the
first time it is asked for a name."""
