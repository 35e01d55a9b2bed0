"""Bounded inputs: each party proves, to two non-colluding verifiers, that its input's L2 norm is within its bound.

A fully linear proof over F_(2^52 - 47) (Boneh, Boyle, Corrigan-Gibbs, Gilboa, Ishai 2019; the PINE
construction's shape): :mod:`.field` the arithmetic, :mod:`.layout` the circuit's sizes and soundness,
:mod:`.flp` the proof and its linear queries, :mod:`.shares` the client's report, :mod:`.verifier` one
report's verification. The round: :mod:`.context` what it is bound to, :mod:`.upload` a site's SHARE,
:mod:`.exchange` the verifiers' messages, :mod:`.verifying` each verifier's state, :mod:`.record` DECIDE
and the site's check, :mod:`.stages` the declared steps, :mod:`.simulate` a round in process. Protocol
code only, without I/O; docs/security.md ("Bounded inputs (two verifiers)") gives the construction, its
soundness and its trust model.
"""
