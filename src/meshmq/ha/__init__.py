"""Master/slave high availability: lease decisions (pure), role machine, lease backends."""
