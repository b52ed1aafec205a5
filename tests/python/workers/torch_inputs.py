"""The inputs the torch check workers (torch_checks.py, c10d_checks.py) reduce and move."""
import torch


def input_of(r, n, dtype, op="sum"):
    """Rank r's input: small integers, exact in every type (products of {1, 2} over at
    most 4 ranks fit in int8; sums of [-5, 5] too)."""
    i = torch.arange(n)
    if op == "prod":
        v = 1 + (i + r) % 2
    else:
        v = (i * 7 + r * 3) % 11
        if dtype != torch.uint8:
            v = v - 5
    return v.to(dtype)
