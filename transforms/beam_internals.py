"""The one module that uses names Beam does not publish, and why each is needed.

Beam's private names (a leading `_`, or a module outside its documented API) change without
notice between releases; apache-beam is pinned exactly (setup.py) and this list is all a Beam
upgrade needs to check (tests/cli/test_beam_internals.py fails on a new Beam until it is checked).

- `CacheAware` (apache_beam.runners.worker.statecache): Beam's state cache sizes every side
  input it loads by walking all its objects (objsize, ~1 us an object: a 200,000-class table of
  [count, weight] lists is ~600,000 of them) for each stage that reads it. A side input that is
  CacheAware names what to walk (transforms/coders.py SideDict, SideList): nothing, its table is
  sized on its own. Beam offers no public hook for it.
"""

from apache_beam.runners.worker.statecache import CacheAware

# The Beam release these names were checked against.
BEAM_CHECKED = "2.77.0"

__all__ = ["BEAM_CHECKED", "CacheAware"]
