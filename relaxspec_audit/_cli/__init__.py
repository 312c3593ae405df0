"""Sub-commands of the relaxspec-audit CLI (one module each, imported lazily)."""
