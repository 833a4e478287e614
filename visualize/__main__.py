from visualize.cli import main

main()
