# spalloc_server 7.1 configuration for benchmarking without hardware: one
# machine "m" of 6 x 4 triads (72 boards), as arbiter's bench configuration.
# 7.1's with_standard_ips wants a BMP location for every board: cabinet 0,
# frames 0-2, 24 boards a frame. The listening port comes from --port (7.1
# no longer listens on Configuration's port).
_W, _H = 6, 4
_locs = {}
for _i, _xyz in enumerate(
        (x, y, z) for x in range(_W) for y in range(_H) for z in range(3)):
    _locs[_xyz] = (0, _i // 24, _i % 24)

configuration = Configuration(
    machines=[
        Machine.with_standard_ips(
            name="m", width=_W, height=_H, board_locations=_locs,
            base_ip="10.11.0.0"),
    ],
    ip="127.0.0.1",
    seconds_before_free=0,
)
