"""Fashion-MNIST as tensors, read from Debian's dataset-fashion-mnist (IDX
files, gzip-compressed) with NumPy alone."""

import gzip
import os

import numpy as np
import torch

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    dims = magic & 0xFF
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(train=True, directory=DEFAULT_DIR, limit=0):
    """(images N x 1 x 28 x 28 float32 in [0, 1], labels N int64) as a
    TensorDataset; `limit` > 0 keeps the first `limit` samples."""
    prefix = "train" if train else "t10k"
    x = _idx(os.path.join(directory, prefix + "-images-idx3-ubyte.gz"))
    y = _idx(os.path.join(directory, prefix + "-labels-idx1-ubyte.gz"))
    if limit:
        x, y = x[:limit], y[:limit]
    images = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    return torch.utils.data.TensorDataset(images, torch.from_numpy(y.astype(np.int64)))
