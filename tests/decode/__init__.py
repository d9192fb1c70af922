"""The decode loop and the request path around it: invariants of the loop, stops and streams, batches, budgets,
constraints, threads and memory across requests."""
