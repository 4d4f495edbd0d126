"""The record lifecycle: apply -> review -> chain -> code issued, plus settlement.

Subpackages, one per service of the seed: `code` (claims, record state, AVCC codes), `review`
(rules, task state), `chain` (ledger and chain backends), `settlement` (clearing). Pure domain
code: nothing here builds a faust App or talks to a broker.
"""
