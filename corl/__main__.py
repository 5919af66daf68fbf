from corl.cli import main

main()
