"""The bounded sum's prime p = 2^52 - 47 and the constants its reduction folds with.

Apart from :mod:`.field` so that its compiled loops (:mod:`.field_loops`, which :mod:`.field` imports on first use)
take the same constants without importing the field back: why this prime is :mod:`.field`'s docstring.
"""

from __future__ import annotations

ELEMENT_BITS = 52
"""Bits of one element on the wire: elements are below 2^52, so :func:`to_wire` drops each uint64's top twelve."""

FOLD = 47
"""c in p = 2^52 - c: the least c that makes it prime, so 2^52 = c (mod p) folds a product's high part."""

P = (1 << ELEMENT_BITS) - FOLD
"""The field's modulus, the largest prime below 2^52."""
