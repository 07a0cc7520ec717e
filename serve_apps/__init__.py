"""Decision-service applications for Ray Serve."""
