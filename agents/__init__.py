"""Agent groups: each module builds one group's faust agents, web views and services."""
