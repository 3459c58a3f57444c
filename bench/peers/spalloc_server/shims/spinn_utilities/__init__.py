# Stands in for SpiNNUtils: spalloc_server uses only abstract_base and overrides.
