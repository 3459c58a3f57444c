# Stands in for SpiNNMan: only the names spalloc_server's
# async_bmp_controller imports. launch.py replaces the controller that would
# use them, so none is ever called.
