"""Run the reference spalloc_server with no BMP hardware.

spalloc_server.controller.AsyncBMPController, which speaks to real BMPs,
is replaced by InstantBMPController: every power or link request succeeds
at once, on a thread of the controller's own, as the real one answers from
its own thread. Jobs go from POWER to READY as soon as their boards are
powered. Then spalloc_server.server.main() runs with the command line.
"""
import queue
import sys
import threading

import spalloc_server.controller
from spalloc_server.server import main


class InstantBMPController:
    """AsyncBMPController's interface, with requests done at once."""

    def __init__(self, hostname, on_thread_start=None):
        self.hostname = hostname
        self._lock = threading.RLock()
        self._done = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(on_thread_start,), daemon=True,
            name="instant BMP {}".format(hostname))
        self._thread.start()

    def _run(self, on_thread_start):
        if on_thread_start is not None:
            on_thread_start()
        while True:
            on_done = self._done.get()
            if on_done is None:
                return
            on_done(True)

    # The controller takes the lock around add_requests.
    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *_exc):
        self._lock.release()

    def add_requests(self, requests):
        self._done.put(requests.on_done)

    def stop(self):
        self._done.put(None)

    def join(self):
        self._thread.join()


spalloc_server.controller.AsyncBMPController = InstantBMPController

if __name__ == "__main__":
    sys.exit(main())
