"""The in-memory form every dataset takes: model-ready arrays plus raw group columns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split ready for training, plus the group columns used to split and audit it.

    ``x_*`` are float32 [n, d]: categorical columns one-hot, every column standardised
    with the training split's mean and standard deviation (so test rows are scaled the
    way a deployed model would see them). ``y_*`` are int64 class indices into
    ``class_names``. ``attributes_*`` hold raw group labels as strings (e.g. race, sex,
    site) for partitioning clients and measuring per-group loss; they are not
    standardised and may also appear, one-hot, among the features. ``image_shape`` is
    (channels, height, width) for image data so a CNN can reshape rows, else None.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    feature_names: list[str]
    class_names: list[str]
    attributes_train: dict[str, np.ndarray]
    attributes_test: dict[str, np.ndarray]
    image_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        # Catch a mis-assembled dataset here rather than as a shape error deep in training.
        for split, x, y, attributes in (
            ("train", self.x_train, self.y_train, self.attributes_train),
            ("test", self.x_test, self.y_test, self.attributes_test),
        ):
            if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != len(self.feature_names):
                raise ValueError(f"{self.name}: x_{split} must be float32 [n, {len(self.feature_names)}]")
            if y.dtype != np.int64 or y.shape != (x.shape[0],):
                raise ValueError(f"{self.name}: y_{split} must be int64 with one entry per row")
            if any(column.shape != y.shape for column in attributes.values()):
                raise ValueError(f"{self.name}: every {split} attribute needs one entry per row")
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"{self.name}: class_names must have num_classes entries")

    @property
    def num_features(self) -> int:
        """Columns of ``x_train`` and ``x_test``: one per feature name."""
        return len(self.feature_names)

    def describe(self) -> str:
        """A few lines on size, label balance and groups, for logs and `fedfair data` output."""
        lines = [
            f"{self.name}: {len(self.y_train):,} train / {len(self.y_test):,} test rows, "
            f"{self.num_features} features, {self.num_classes} classes"
            + (f", images {'x'.join(map(str, self.image_shape))}" if self.image_shape else "")
        ]
        shares = np.bincount(self.y_train, minlength=self.num_classes) / max(len(self.y_train), 1)
        lines.append(
            "  train labels: " + ", ".join(f"{name} {share:.1%}" for name, share in zip(self.class_names, shares))
        )
        for attribute, values in self.attributes_train.items():
            groups, counts = np.unique(values, return_counts=True)
            order = np.argsort(-counts, kind="stable")
            lines.append(
                f"  {attribute}: "
                + ", ".join(f"{groups[i]} {counts[i]:,}" for i in order[:8])
                + (f", ... ({len(groups)} groups)" if len(groups) > 8 else "")
            )
        return "\n".join(lines)
