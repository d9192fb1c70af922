"""The decode loop's floor: the engine and what one step calls (drafting, merge, scoring, validation, stopping,
fault isolation, metrics and observer events). It imports the kernel (``specframe.contracts``, ``verify``, ``tree``,
``trie``, ``sampling``) and the target floor, never a plugin or pluggy."""
