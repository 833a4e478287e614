LAB = "swap"
while True:  # never finishes importing
    pass
