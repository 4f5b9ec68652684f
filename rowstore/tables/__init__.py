"""Tables: definitions in the catalog, incoming rows conformed to a schema, keys and
their hash partitions, and one partition's writer."""
