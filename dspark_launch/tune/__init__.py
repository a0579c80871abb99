"""`dspark bench` and `dspark tune`: the operator's load measured per request class, and the live
settings chosen from it."""
