def create_transceiver_from_hostname(*args, **kwargs):
    raise RuntimeError("no SpiNNaker hardware in this setup")
