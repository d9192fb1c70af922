"""The kernel: acceptance rules, draft and token trees, sampling exactness and the small contracts, tested on hand-built
inputs (docs/how-it-works.md, "The package's floors")."""
