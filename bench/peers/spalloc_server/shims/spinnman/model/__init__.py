class BMPConnectionData:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("no BMP hardware in this setup")
