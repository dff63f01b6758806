"""The one module that uses names Beam does not publish, and why each is needed.

Beam's private names change without notice; apache-beam is pinned exactly (setup.py) and this
list is all a Beam upgrade needs to check (tests/cli/test_beam_internals.py fails on a new Beam).

- `CacheAware` (apache_beam.runners.worker.statecache): Beam's state cache sizes every side
  input it loads by walking all its objects (objsize, ~1 us an object: a 200,000-class table is
  ~600,000 of them) for each stage that reads it. A CacheAware side input names what to walk
  (transforms/coders.py SideDict, SideList): nothing. Beam offers no public hook for it.
"""

from apache_beam.runners.worker.statecache import CacheAware

# The Beam release these names were checked against.
BEAM_CHECKED = "2.77.0"

__all__ = ["BEAM_CHECKED", "CacheAware"]
