"""Text shipped with ArkInfer: the demo model's training corpus and a held-out evaluation text (see README.md)."""
