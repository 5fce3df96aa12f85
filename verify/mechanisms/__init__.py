"""Registry records, one module per mechanism family (importing a module registers its records)."""
