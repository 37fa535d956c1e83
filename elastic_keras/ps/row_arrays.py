"""Row arrays of an embedding table: growing them, writing rows in place, merging ids.

The helpers `EmbeddingTable` uses on its `[capacity, dim]` arrays: huge-page advice for
large arrays, growing an array (in place where it can), handing freed
memory back to the system, whole-row scatter, and the distinct ids of a batch with their
gradients summed.
"""

import ctypes
import mmap
import sys

import numpy as np

_MADV_HUGEPAGE = 14  # Linux


def advise_huge_pages(array):
    """Asks Linux to back `array`'s pages with huge pages where it can; elsewhere, or where
    transparent huge pages are off, nothing changes."""
    if _LIBC is None or array.nbytes < 4 << 20:
        return
    start = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    _LIBC.madvise(start, array.ctypes.data + array.nbytes - start, _MADV_HUGEPAGE)


def release_free_memory():
    """Hands the memory the allocator holds free back to the system (glibc's
    `malloc_trim`): arrays a table outgrew or rebuilt leave free heap behind, which would
    otherwise stay in the process's resident memory (about 30 MB at a million rows)."""
    if _TRIM is not None:
        _TRIM(0)


if sys.platform.startswith("linux"):
    _LIBC = ctypes.CDLL(None)
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc only
else:
    _LIBC = _TRIM = None


def grow(holder, key, shape):
    """Grows the array `holder[key]` to `shape`. `resize` extends a buffer in place (for large
    arrays usually without copying) when nothing else refers to the array; it counts
    references, so it is called on the holder's entry itself, not on a local name."""
    try:
        holder[key].resize(shape, refcheck=True)
    except ValueError:
        grown = np.empty(shape, dtype=holder[key].dtype)
        grown[:len(holder[key])] = holder[key]
        holder[key] = grown


def as_slice(slots):
    """`slots` as a slice where they are consecutive (a faster write), else as they are."""
    if len(slots) and slots[-1] - slots[0] == len(slots) - 1 and np.all(np.diff(slots) == 1):
        return slice(int(slots[0]), int(slots[-1]) + 1)
    return slots


def scatter(array, slots, rows):
    """`array[slots] = rows` for distinct slots, copying whole rows at once."""
    row = np.dtype((np.void, array.shape[1] * array.itemsize))
    rows = np.ascontiguousarray(rows, dtype=array.dtype)
    array.view(row).reshape(-1)[slots] = rows.view(row).reshape(-1)


def distinct(ids):
    """The distinct ids, and the index of each id among them.

    Ids usually arrive distinct (workers deduplicate): a sort tells, and they are returned as
    they are; otherwise they come back sorted.
    """
    ordered = np.sort(ids)
    if not np.any(ordered[1:] == ordered[:-1]):
        return ids, np.arange(len(ids))
    return np.unique(ids, return_inverse=True)


def sum_repeated(ids, grads):
    """One gradient row per distinct id, the rows of a repeated id added."""
    unique, positions = distinct(ids)
    if len(unique) == len(ids):
        return ids, grads
    summed = np.zeros((len(unique), grads.shape[1]), dtype=grads.dtype)
    np.add.at(summed, positions, grads)
    return unique, summed
