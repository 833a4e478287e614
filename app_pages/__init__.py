"""Pages of the Streamlit app (app.py wires them together). Engine logic stays in engine/, figures in visualize/."""
