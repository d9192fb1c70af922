"""specframe's own text for the SPEED-Bench-shaped workload (:mod:`specframe.bench.workload`): instructions, topics,
short passages and facts written for specframe, under the repository's licence (Apache-2.0). Facts (dates, units,
boiling points) are common knowledge in our own wording; no sentence is copied from elsewhere.

Every list is read in a seeded order by the builder, so editing a list changes the workload: the sidecar
``sources.json`` records a hash of this module's text.
"""

from __future__ import annotations

# --- coding ---------------------------------------------------------------------------------------------------------

CODE_EDITS = [  # low entropy: the answer is the given function, slightly changed
    "Rename every single-letter local variable of this Python function to a descriptive snake_case name, change "
    "nothing else, and return the complete function.",
    "Add type hints to the parameters and the return value of this Python function. Return the whole function; "
    "everything but the signature stays exactly as it is.",
    "Remove the docstring and every comment from this Python function and return the rest of it unchanged.",
    "Reformat this Python function so that no line is longer than 72 characters. Return the complete code and "
    "change no names.",
    "Convert every string formatting in this Python function to f-strings where that is possible, and return the "
    "whole function otherwise unchanged.",
]
CODE_REVIEWS = [  # mixed: explanation around the code
    "Explain step by step what this Python function does, then write three pytest tests for it.",
    "Review this Python function: name one edge case it handles, one it might not, and suggest a small improvement.",
    "Describe the inputs and outputs of this Python function, then rewrite its docstring in NumPy style.",
    "What is the time complexity of this Python function? Justify your answer with reference to its loops.",
]
CODE_TASKS = [  # high: open-ended programs
    "simulates the queue at a small bakery, with customers arriving at random times",
    "plays tic-tac-toe against the user in the terminal",
    "prints a text calendar of any month, with weekends marked",
    "keeps a to-do list in a JSON file and lets the user add, finish and list tasks",
    "generates a random maze and then solves it",
    "converts Roman numerals to integers and back, rejecting invalid input",
    "finds the shortest path between two stations of a small subway map you invent",
    "implements a tiny stack-based calculator language",
    "renders a bar chart of word frequencies in a text, using only characters",
    "schedules meetings for a team so that nobody has two meetings at once",
    "implements the game of life on a wrapping grid",
    "compresses a string with run-length encoding and checks the round trip",
]

# --- humanities -----------------------------------------------------------------------------------------------------

TIMELINES = {  # low entropy: reformat or reorder given lines
    "the history of writing and printing": [
        ("around 3200 BCE", "cuneiform writing appears in Mesopotamia"),
        ("around 1200 BCE", "the Phoenician alphabet develops"),
        ("105 CE", "papermaking is reported at the Han court in China"),
        ("868", "the Diamond Sutra, the oldest dated printed book known, is printed"),
        ("around 1040", "Bi Sheng invents movable type made of clay"),
        ("around 1450", "Gutenberg prints with movable metal type in Mainz"),
        ("1605", "the first printed newspaper appears in Strasbourg"),
    ],
    "the age of sail and exploration": [
        ("1405", "Zheng He sets out on the first of seven voyages"),
        ("1488", "Bartolomeu Dias rounds the Cape of Good Hope"),
        ("1492", "Columbus reaches the Caribbean"),
        ("1498", "Vasco da Gama reaches India by sea"),
        ("1522", "the survivors of Magellan's expedition complete the first circumnavigation"),
        ("1606", "Willem Janszoon charts part of the Australian coast"),
        ("1768", "James Cook begins his first Pacific voyage"),
    ],
    "ancient philosophy": [
        ("around 585 BCE", "Thales is said to predict a solar eclipse"),
        ("around 530 BCE", "Pythagoras founds his school in Croton"),
        ("399 BCE", "Socrates is tried and executed in Athens"),
        ("around 387 BCE", "Plato founds the Academy"),
        ("335 BCE", "Aristotle founds the Lyceum"),
        ("around 307 BCE", "Epicurus opens the Garden in Athens"),
        ("around 300 BCE", "Zeno of Citium begins teaching Stoicism"),
    ],
    "the scientific revolution": [
        ("1543", "Copernicus publishes his heliocentric model"),
        ("1609", "Kepler publishes his first two laws of planetary motion"),
        ("1610", "Galileo reports the moons of Jupiter"),
        ("1628", "Harvey describes the circulation of the blood"),
        ("1660", "the Royal Society is founded in London"),
        ("1687", "Newton publishes the Principia"),
        ("1735", "Linnaeus publishes the first edition of Systema Naturae"),
    ],
    "music history": [
        ("around 1025", "Guido of Arezzo describes a staff notation"),
        ("1600", "one of the earliest surviving operas is performed in Florence"),
        ("1722", "Bach completes the first book of The Well-Tempered Clavier"),
        ("1786", "Mozart's The Marriage of Figaro premieres in Vienna"),
        ("1824", "Beethoven's Ninth Symphony premieres"),
        ("1877", "Edison demonstrates the phonograph"),
        ("1913", "The Rite of Spring premieres in Paris"),
    ],
}
TIMELINE_TASKS = [
    "Turn this list about {topic} into a Markdown table with the columns Date and Event. Keep the wording of every "
    "event exactly as given.",
    "These events from {topic} are out of order. Copy them in chronological order, one per line, each line exactly "
    "as written.",
    "Rewrite each line of this list about {topic} as a full sentence that starts with its date, in the same order.",
]
CONCEPT_PAIRS = [  # mixed: explanations with a known shape
    ("rationalism", "empiricism"), ("a republic", "a direct democracy"), ("Romanticism", "the Enlightenment"),
    ("primary sources", "secondary sources"), ("ethics", "morality"), ("a myth", "a legend"),
    ("the Renaissance", "the Middle Ages"), ("deductive arguments", "inductive arguments"),
    ("Stoicism", "Epicureanism"), ("a sonnet", "a haiku"), ("absolute monarchy", "constitutional monarchy"),
    ("mercantilism", "free trade"),
]
CONCEPT_TASK = "Explain the difference between {a} and {b} in about 150 words, with one historical example of each."
ESSAY_THEMES = [  # high: open-ended essays
    "what a city owes to the people who lived in it before",
    "whether history is written by the winners",
    "why people keep diaries",
    "the role of boredom in creativity",
    "what we lose and gain when a language disappears",
    "how a single invention changed family life",
    "whether museums should return objects to their countries of origin",
    "the meaning of a promise",
    "why we tell stories about the end of the world",
    "what makes a place feel like home",
]
ESSAY_TASK = "Write a reflective essay of about 400 words on {theme}. Take a clear position and argue for it."

# --- math -----------------------------------------------------------------------------------------------------------

ARITHMETIC_TASKS = [  # low entropy: the procedure fixes the answer
    "Multiply {a} by {b} using long multiplication. Show each partial product on its own line, then their sum.",
    "Add these numbers column by column, writing the carry of each column: {numbers}.",
    "Convert {n} to binary by repeated division by 2. Show every division on its own line, then read off the result.",
    "Find the greatest common divisor of {a} and {b} with the Euclidean algorithm, one step per line.",
]
WORD_PROBLEM = ("{name} buys {n1} notebooks at ${p1} each and {n2} pens at ${p2} each, and pays with a ${paid} bill. "
                "How much change does {name} get back? Explain each step.")
NAMES = ["Amara", "Bruno", "Chen", "Dalia", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Keira", "Luca", "Mina",
         "Nils", "Olu", "Priya"]
MATH_OPEN_TOPICS = ["a garden", "a train timetable", "a chess tournament", "a bakery", "a bicycle race", "a library",
                    "a music festival", "a fishing trip"]
MATH_OPEN_TASKS = [
    "Invent an original math puzzle about {topic} for a curious 12-year-old, then solve it and explain the idea "
    "behind it.",
    "Make up a probability question involving {topic}, answer it, and then change one detail to make it harder.",
    "Explain, in two different ways of your own choosing, why the sum of the first n odd numbers is a square. "
    "Use {topic} in one of them.",
]

# --- multilingual ---------------------------------------------------------------------------------------------------

PASSAGES = {  # low entropy: number / copy sentences of a non-English text (our own text)
    "German": "Am Montag regnete es den ganzen Tag. Die Kinder spielten im Wohnzimmer mit alten Kartons. Am Abend "
              "kochte die Großmutter eine Suppe aus Kartoffeln und Lauch. Danach las der Vater eine Geschichte vor. "
              "Um neun Uhr schliefen alle tief und fest.",
    "French": "Le marché ouvre à sept heures chaque samedi. Les maraîchers installent leurs tables sous les "
              "platanes. On y trouve des tomates, du fromage et du pain encore chaud. Vers midi, la place se vide "
              "lentement. Il ne reste alors que le bruit de la fontaine.",
    "Spanish": "El tren salió de la estación con diez minutos de retraso. Por la ventana se veían campos de olivos "
               "y pueblos blancos. Una niña dibujaba caballos en un cuaderno. Su abuelo dormía con el sombrero sobre "
               "la cara. Llegamos a Sevilla justo antes del atardecer.",
    "Italian": "La biblioteca del paese è piccola ma sempre piena. Il bibliotecario conosce i gusti di ogni lettore. "
               "Il martedì arrivano i libri nuovi. I bambini aspettano davanti alla porta. Ognuno torna a casa con "
               "una borsa pesante.",
    "Portuguese": "O farol fica no fim de uma estrada de terra. Durante o dia, as gaivotas descansam nas rochas. À "
                  "noite, a luz gira sobre o mar escuro. Os pescadores conhecem o seu ritmo de cor. Há mais de cem "
                  "anos que ele guia os barcos.",
    "Dutch": "In de winter bevriest de gracht soms helemaal. Dan halen de mensen hun schaatsen van zolder. Er staan "
             "kraampjes met warme chocolademelk. Kinderen leren vallen en weer opstaan. Na een week is het ijs meestal "
             "alweer gesmolten.",
}
COPY_TASKS = [
    "Put each sentence of the following {lang} text on its own numbered line. Do not change, add or translate any "
    "word.",
    "Copy the following {lang} text, but write it as a bulleted list with one sentence per bullet, keeping every "
    "word as it is.",
]
ENGLISH_SENTENCES = [  # mixed: translation
    "The museum is closed on Mondays, but the garden stays open until sunset.",
    "Could you tell me where the nearest pharmacy is?",
    "We missed the last bus, so we walked home along the river.",
    "My sister plays the cello in an orchestra that rehearses every Thursday.",
    "Please remember to water the plants while I am away.",
    "The recipe needs three eggs, a cup of flour and a pinch of salt.",
    "After the storm, the whole village helped to repair the school roof.",
    "I have been learning to bake bread for six months.",
    "The meeting was moved to the small room on the second floor.",
    "When the snow melts, the path to the lake becomes muddy.",
    "He wrote a letter to his old teacher to thank her.",
    "The library lends out tools as well as books.",
]
LANGUAGES = ["German", "French", "Spanish", "Italian", "Portuguese", "Dutch"]
TRANSLATE_TASK = "Translate the following sentences into {lang}:\n\n{text}"
OPEN_PROMPTS = [  # high: open-ended writing in another language (our own text)
    ("German", "Schreibe eine kurze Geschichte über einen Leuchtturmwärter, der eines Morgens einen Brief im Sand "
               "findet."),
    ("French", "Écris un poème libre sur une ville au petit matin, avant que les gens ne se réveillent."),
    ("Spanish", "Escribe una carta a tu yo de dentro de veinte años contándole cómo es tu vida hoy."),
    ("Italian", "Descrivi il tuo piatto preferito come se fosse il protagonista di una fiaba."),
    ("Portuguese", "Escreve um diálogo entre duas árvores que vivem na mesma praça há cem anos."),
    ("Dutch", "Schrijf een kort verhaal over een fiets die op een dag zelf besluit waar hij heen gaat."),
    ("German", "Erfinde ein Märchen, in dem ein Regenschirm die Hauptrolle spielt."),
    ("French", "Raconte la journée d'un chat qui croit être le maire de son quartier."),
    ("Spanish", "Inventa un mito que explique por qué la luna cambia de forma."),
    ("Italian", "Scrivi un breve racconto su un orologio che un giorno smette di contare il tempo."),
]

# --- qa -------------------------------------------------------------------------------------------------------------

FACT_QUESTIONS = [  # mixed: short factual answers with a reason
    "At what temperature does water boil at sea level in degrees Celsius, and why is it lower on a high mountain?",
    "How many bones does an adult human have, and why does a newborn have more?",
    "Which planet in our solar system has the shortest day, and roughly how long is it?",
    "What is the chemical symbol of gold, and where does it come from?",
    "Why is the sky blue on a clear day?",
    "How many sides does a hexagon have, and where do hexagons occur in nature?",
    "What gas do plants take in for photosynthesis, and what do they release?",
    "What is the largest ocean on Earth, and which continents border it?",
    "Why do we have leap years?",
    "What is the speed of sound in air at room temperature, approximately?",
    "What does DNA stand for, and what does it do in a cell?",
    "Why does ice float on water?",
    "What is the difference between weather and climate?",
    "How many minutes does sunlight take to reach the Earth, roughly?",
    "Which organ of the human body uses the most energy at rest?",
    "What is a prime number? Give the first five.",
]
OPEN_QUESTIONS = [  # high: open-ended questions
    "What would change in everyday life if nobody could lie for a week?",
    "If you could add one subject to every school's curriculum, what would it be and why?",
    "What makes a conversation memorable?",
    "How might cities look in a hundred years if cars disappeared?",
    "What is a skill that everyone should learn, and how would you teach it?",
    "Why do some songs get stuck in our heads?",
    "What would you ask the first person to live on Mars?",
    "Is it better to be a generalist or a specialist? Defend your view.",
    "What small habit could improve a whole neighbourhood?",
    "How would you explain the internet to someone from the year 1800?",
]
QUOTE_TASK = ("Here is the documentation of {name} from Python's standard library. Quote its first sentence word for "
              "word, then list every parameter name it mentions.\n\n{doc}")

# --- rag ------------------------------------------------------------------------------------------------------------

RAG_LOW = ("Below are numbered passages. Which passage mentions \"{word}\"? Answer with the passage number, then copy "
           "that passage word for word.\n\n{context}")
RAG_MIXED = ("Answer using only the documents below. Explain what {name} does and when you would use it; say which "
             "document you relied on.\n\n{context}")
RAG_HIGH = ("Read the documents below, then write a short, original blog post for beginners inspired by them, in your "
            "own words and with an example of your own.\n\n{context}")

# --- reasoning ------------------------------------------------------------------------------------------------------

PEOPLE = ["Ada", "Ben", "Cleo", "Dev", "Esme", "Finn", "Gia", "Hugo"]
ORDER_TASK = ("{facts}\n\nUsing only these facts, list the people from oldest to youngest, one name per line, and "
              "nothing else.")
SEQUENCE_TASK = "What is the next number in the sequence {seq}, ...? Explain the rule you found."
CLAIMS = [
    "Homework should be abolished in primary schools.",
    "Cities should ban cars from their centres.",
    "Everyone should learn to program.",
    "Space exploration is worth its cost.",
    "Zoos do more good than harm.",
    "A four-day working week would make people more productive.",
    "Handwriting should still be taught in schools.",
    "Public transport should be free.",
    "Tourism does more harm than good to small towns.",
    "Artificial light at night should be regulated.",
]
ARGUE_TASK = "Argue for and against the claim: \"{claim}\" Then state your own conclusion and the reason that decided it."

# --- roleplay -------------------------------------------------------------------------------------------------------

SCRIPTS = [  # low entropy: say the given lines
    ["Good evening, and welcome to the Harbour Theatre.", "Tonight's performance will last two hours.",
     "There will be one interval of fifteen minutes.", "Please switch off your phones.", "Enjoy the show."],
    ["Attention, passengers.", "The train to Northfield will depart from platform four.",
     "Please mind the gap between the train and the platform.", "The café car is at the rear of the train.",
     "Thank you for travelling with us."],
    ["Welcome to the City Museum audio guide.", "You are standing in the Hall of Clocks.",
     "The oldest clock here was built in 1620.", "Press two to hear how it works.", "Press three to continue."],
    ["Hello, this is the library's answering machine.", "We are open from nine to six, Monday to Saturday.",
     "Returned books can be left in the box by the door.", "For the children's reading hour, press one.",
     "Goodbye."],
]
SCRIPT_TASK = ("You are a voice actor recording an announcement. Say these lines exactly as written, one per line, "
               "with no commentary:\n\n{lines}")
ROLES = [  # mixed: a role with a concrete question, two turns
    ("a park ranger in a mountain national park", "What should I pack for a day hike here in October?",
     "And what do I do if I meet a bear on the trail?"),
    ("a librarian at a small town library", "Can you recommend three books for someone who liked adventure stories?",
     "Which one would you read first, and why?"),
    ("a ship's cook on a long voyage", "What do you cook when the fresh food runs out?",
     "Give me the recipe for your crew's favourite meal."),
    ("a tour guide in an old harbour town", "What is the story behind the lighthouse?",
     "Where should I eat dinner tonight?"),
    ("a bicycle mechanic", "My chain keeps slipping. What could be wrong?", "How do I check it myself?"),
    ("a beekeeper", "How do bees decide where to build a new hive?", "What does a beekeeper do in winter?"),
]
ROLE_TASK = "Pretend you are {role}. Stay in that role. {question}"
CHARACTERS = [  # high: open-ended, three turns
    ("Captain Orla Venn, a retired airship pilot who tells tall tales",
     ["Tell me about the strangest storm you ever flew through.", "Did anyone believe you afterwards?",
      "What would you tell a young pilot today?"]),
    ("Mister Pim, a very polite dragon who runs a tea shop",
     ["What is on the menu today?", "A knight just walked in. What do you say to him?",
      "Describe how you close the shop at night."]),
    ("Professor Ilse Marr, a time traveller who keeps losing her notebook",
     ["Where did you last see your notebook?", "What did you see in the year 3000?",
      "Give me one piece of advice about the future."]),
    ("Tumble, a street cat who thinks he is a detective",
     ["Who stole the fish from the market?", "How did you find out?", "What is your next case?"]),
    ("Queen Maren of a small mountain kingdom",
     ["Your subjects complain about the roads. What will you do?", "The neighbouring king sends a gift. How do you "
      "answer?", "Write your speech for the spring festival."]),
    ("an old lighthouse that can talk",
     ["What have you seen in your hundred years?", "Which ship do you remember most?",
      "What do you think about when the sea is calm?"]),
]
CHARACTER_TASK = "You are {character}. Stay in character for the whole conversation. {turn}"

# --- stem -----------------------------------------------------------------------------------------------------------

UNITS = [  # (quantity, unit, SI unit, factor to SI)
    ("length", "inches", "metres", 0.0254), ("length", "feet", "metres", 0.3048), ("length", "miles", "metres", 1609.344),
    ("mass", "pounds", "kilograms", 0.45359237), ("mass", "ounces", "kilograms", 0.028349523125),
    ("volume", "litres", "cubic metres", 0.001), ("speed", "kilometres per hour", "metres per second", 1 / 3.6),
    ("energy", "kilocalories", "joules", 4184.0), ("pressure", "bar", "pascals", 100000.0),
    ("time", "hours", "seconds", 3600.0),
]
UNITS_TASK = ("Convert each measurement to SI units and give the result as a Markdown table with the columns "
              "Quantity, Given, SI value. Round to three significant figures.\n\n{lines}")
PHENOMENA = [
    "how a refrigerator moves heat from inside to outside", "why the Moon always shows the same face to the Earth",
    "how a transistor switches a current", "why a spinning top does not fall over",
    "how vaccines train the immune system", "how a rainbow forms", "why metals conduct electricity",
    "how GPS receivers find their position", "why the oceans have tides", "how an electric motor turns",
]
STEM_EXPLAIN = "Explain {phenomenon}. Give the key physical principle and, if there is one, the equation behind it."
SCENARIOS = [
    "the Earth had two moons", "water were densest as ice", "the speed of light were 100 km/h",
    "plants could move slowly like animals", "the day lasted a hundred hours", "humans could see ultraviolet light",
    "there were no friction for one minute", "the Sun suddenly became twice as bright",
]
STEM_SPECULATE = ("Imagine a world where {scenario}. Describe what would follow, physically and biologically, and say "
                  "where you are speculating.")

# --- summarization / writing ----------------------------------------------------------------------------------------

SUMMARY_LOW = ("Copy the first sentence of each paragraph below, in order, as a bulleted list. Do not change any "
               "word.\n\n{text}")
SUMMARY_MIXED = "Summarize the following text in three to five bullet points.\n\n{text}"
SUMMARY_HIGH = [
    "Retell the following text as a short fable for children, with animals as the characters.\n\n{text}",
    "Turn the following text into a sequence of three haiku that capture its main ideas.\n\n{text}",
    "Write a lively radio news item of about 120 words that tells listeners about the following text.\n\n{text}",
]
PROOFREAD_TASK = ("Correct the spelling mistakes in the following text. Return the corrected text and change nothing "
                  "else.\n\n{text}")
REWRITE_TASKS = [
    "Rewrite the following paragraph in a formal, academic tone.\n\n{text}",
    "Rewrite the following paragraph for a ten-year-old reader.\n\n{text}",
]
STORY_OPENINGS = [
    "The last train of the night stopped at a station that was not on the map.",
    "Every morning, the baker found one loaf missing and a feather in its place.",
    "On her ninetieth birthday, my grandmother finally told us about the box in the attic.",
    "The robot had been built to sweep floors, but it wanted to paint.",
    "Nobody in the village had ever seen the other side of the forest.",
    "The letter arrived forty years late.",
    "It was the only umbrella left in the lost-and-found office.",
    "The lighthouse keeper counted ships, and one night there was one too many.",
    "When the power went out, the whole street came outside.",
    "The map was drawn on the back of a concert ticket.",
]
STORY_TASK = "Write a short story of about 400 words that begins with the sentence: \"{opening}\""

# --- long inputs (throughput tiers) ---------------------------------------------------------------------------------

LONG_CODE = ("Below is code from Python's standard library. Return it with every comment and docstring removed, "
             "and the code itself exactly as it is.\n\n```python\n{context}\n```")
LONG_EXTRACT = ("Below is documentation from Python's standard library, in sections. For every section, copy its "
                "heading and the first sentence under it, in order.\n\n{context}")
LONG_RAG = ("Answer using only the documentation below. Which functions would you combine to {goal}? Explain how, "
            "and name the sections you used.\n\n{context}")
LONG_GOALS = ["parse, check and re-format a piece of text", "read a file, transform its lines and report statistics",
              "build a small command-line tool", "compare two versions of a document"]
LONG_SUMMARY = ("Summarize the documentation below section by section, one or two sentences per section."
                "\n\n{context}")
LONG_STORY = ("Here are technical notes. Do not summarize them: write an original short story in which a character "
              "discovers one of the ideas in these notes by accident.\n\n{context}")
LONG_ROLEPLAY = ("You are a patient teacher meeting a student who has just read the notes below. Greet the student "
                 "and start a lively conversation about whatever in the notes you find most surprising.\n\n{context}")
