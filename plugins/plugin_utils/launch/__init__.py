"""What each rank runs: the launch plans, the ring's layer windows, exit statuses, escaping for the templates."""
