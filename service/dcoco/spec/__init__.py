"""DCOCO speculative decoding: the algorithm, in pure torch with no I/O.

Terms, used with these meanings everywhere in the project:

- **block**: the drafter's input for one cycle, the last verified token followed by B mask slots.
- **slot**: one of the B masked positions; slot p proposes the token at offset p + 1.
- **candidate**: one of the K highest-logit tokens the drafter produced for a slot, in
  descending logit order, so candidate 0 is the slot's top-1.
- **draft**: the B tokens a selection rule picks, one candidate per slot.
- **accepted**: a drafted token the verifier kept. Acceptance stops at the first rejection, so
  the accepted tokens are always a prefix of the draft.
- **bonus**: the one token the verifier adds after the accepted prefix (its own choice at the
  first rejected slot, or after slot B when all were accepted). Every cycle commits
  accepted + 1 tokens; that number, 1..B+1, is the **accepted length**.
- **corrected**: a drafted token whose candidate index is not 0, i.e. where the selection rule
  overrode the drafter's top-1. A corrected token that is accepted was rescued by the corrector.
"""
