"""Reports: tables and plots read from result files only; nothing here runs a benchmark."""
