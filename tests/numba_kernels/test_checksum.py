"""``numba_kernels.cpu.checksum``: HDF5's Fletcher32 against a per-word reference written from its definition
and against the checksums HDF5 itself stored in real files (any dtype, chunk size, edge chunks)."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from numba_kernels.cpu.checksum import fletcher32, fletcher32_chunks


def _reference(data: bytes) -> int:
    """Word by word, in 32-bit arithmetic, as the definition reads (module docstring)."""
    s1 = s2 = 0
    words = len(data) // 2
    i = 0
    while words:
        t = min(360, words)
        words -= t
        for _ in range(t):
            s1 = (s1 + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
            s2 = (s2 + s1) & 0xFFFFFFFF
            i += 2
        s1 = (s1 & 0xFFFF) + (s1 >> 16)
        s2 = (s2 & 0xFFFF) + (s2 >> 16)
    if len(data) % 2:
        s1 = (s1 + (data[i] << 8)) & 0xFFFFFFFF
        s2 = (s2 + s1) & 0xFFFFFFFF
        s1 = (s1 & 0xFFFF) + (s1 >> 16)
        s2 = (s2 & 0xFFFF) + (s2 >> 16)
    s1 = (s1 & 0xFFFF) + (s1 >> 16)
    s2 = (s2 & 0xFFFF) + (s2 >> 16)
    return (s2 << 16) | s1


@pytest.mark.parametrize("n", [0, 1, 2, 3, 719, 720, 721, 1441, 5000])
def test_matches_the_definition_on_random_and_extreme_bytes(n):
    rng = np.random.default_rng(n)
    for data in (rng.integers(0, 256, n, dtype=np.uint8), np.full(n, 255, np.uint8), np.zeros(n, np.uint8)):
        buf = np.concatenate([rng.integers(0, 256, 7, dtype=np.uint8), data, np.full(3, 9, np.uint8)])
        assert int(fletcher32(buf, 7, n)) == _reference(data.tobytes())


@pytest.mark.parametrize("dtype,shape,chunks", [(np.float32, (1003, 37), (100, 37)), (np.float64, (50, 3), (7, 3)),
                                                (np.int64, (301, 5), (300, 5)), (np.int16, (9, 3), (4, 3))])
def test_matches_what_hdf5_stored_and_flags_exactly_the_damaged_chunk(tmp_path, dtype, shape, chunks):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 1000).astype(dtype)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunks, fletcher32=True)
    with h5py.File(path, "r") as f:
        d = f["x"]
        n = d.id.get_num_chunks()
        raws = [d.id.read_direct_chunk(d.id.get_chunk_info(k).chunk_offset)[1] for k in range(n)]
    size = len(raws[0]) - 4
    assert all(len(r) == size + 4 for r in raws)  # edge chunks are stored whole
    buf = np.frombuffer(b"".join(r[:-4] for r in raws), np.uint8).copy()
    stored = np.array([int.from_bytes(r[-4:], "little") for r in raws], np.uint32)
    bad = np.full(n, 7, np.uint8)
    assert fletcher32_chunks(buf, size, stored, bad) == 0 and not bad.any()
    damaged = n // 2
    buf[damaged * size + size // 3] ^= 0x10
    assert fletcher32_chunks(buf, size, stored, bad) == 1 and np.flatnonzero(bad).tolist() == [damaged]


def test_the_byte_order_of_hdf5_before_1_6_3_is_accepted():
    rng = np.random.default_rng(2)
    buf = rng.integers(0, 256, 3 * 64, dtype=np.uint8)
    good = np.array([_reference(buf[k * 64:(k + 1) * 64].tobytes()) for k in range(3)], np.uint32)
    old = ((good & 0x00FF00FF) << 8) | ((good >> 8) & 0x00FF00FF)
    bad = np.zeros(3, np.uint8)
    assert fletcher32_chunks(buf, 64, old.astype(np.uint32), bad) == 0
    assert fletcher32_chunks(buf, 64, (good ^ 1).astype(np.uint32), bad) == 3
