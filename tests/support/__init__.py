"""What the tests share: one module a job (processes, launcher environment, dspark on the testbed,
the namespace testbed, serving, the tiny model, fixtures). Test modules import from here and from
the product only, never from each other."""
