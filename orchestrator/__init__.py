"""dflashctl controller: inventory, transports, run lifecycle, data sources."""
