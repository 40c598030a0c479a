"""Security estimators and a cost model for computationally hidden linear offload.

`lwe` (primal uSVP and dual lattice attacks, core-SVP costs), `lpn` (Gaussian elimination,
Prange and Stern–Dumer ISD, statistical decoding, the Z_{2^k} → F_2 reduction), `params`
(the smallest parameters each candidate needs at a target security) and `speed` (the
predicted speed of each candidate against the sealed CPU path). docs/SECURITY.md,
"Computational hiding", reads its numbers from `python3 attack/estimators`.
"""
