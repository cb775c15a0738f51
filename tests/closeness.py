"""Closeness checks shared by the tests and the benchmarks' inputs (torch only: bench/ imports this
folder's modules top-level)."""


def assert_cosine_close(out, ref, whole: float, per_row: float) -> None:
    """1 - cos(out, ref) below `whole` over the tensor and below `per_row` for every row (the last
    dim: one query row's output vector) whose reference is not zero. The whole-tensor form dilutes a
    wrong row among thousands of right ones; a wrong row's own 1 - cos is ~1."""
    x, y = out.double(), ref.double()
    denom = (x * x + y * y).sum()
    if denom > 0:
        cos_diff = (1 - 2 * (x * y).sum() / denom).item()
        assert cos_diff < whole, f"cosine difference {cos_diff:.3g} (bound {whole:.3g})"
    x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
    row_denom = (x * x + y * y).sum(-1)
    rows = (y != 0).any(-1)
    row_diff = 1 - 2 * (x * y).sum(-1)[rows] / row_denom[rows]
    if row_diff.numel():
        worst = row_diff.max().item()
        assert worst < per_row, (f"a row's cosine difference {worst:.3g} (bound {per_row:.3g}); "
                                 f"{(row_diff >= per_row).sum().item()} of {row_diff.numel()} rows off")
