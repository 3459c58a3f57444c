# SpiNNUtils' overrides checks signatures; here it only keeps the docstring.
def overrides(super_class_method, *_args, **_kwargs):
    def wrap(method):
        if method.__doc__ is None:
            method.__doc__ = getattr(super_class_method, "__doc__", None)
        return method
    return wrap
