class SpallocException(Exception):
    pass
